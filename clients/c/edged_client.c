/* A minimal edged client in C: one infer request for mlp-light over a DEALER socket.
 *
 *     edged_client ENDPOINT [TIMEOUT_MS]
 *
 * Sends a [1, 64] float32 input with x[i] = (i - 32) / 32 (exact in float32, so any
 * language can build the same tensor), then prints the reply:
 *
 *     status OK
 *     timing_us queue=40 compute=60 total=120
 *     output scores float32 [1,10]
 *     value 0.123456791
 *     ...
 *
 * Exit status: 0 for OK, 1 for any other status (its error is printed), 2 when no
 * reply came within TIMEOUT_MS (default 5000) or the arguments or reply were bad.
 * The wire protocol is docs/protocol.md: a msgpack header frame, then one frame of
 * raw little-endian bytes per tensor.
 */
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define ROWS 1
#define FEATURES 64

static void pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* The request header: {v, id, op, model, inputs: [{name, dtype, shape}]}. */
static void pack_header(msgpack_sbuffer *buf) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, buf, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    pack_str(&pk, "v");
    msgpack_pack_int(&pk, 1);
    pack_str(&pk, "id");
    msgpack_pack_int(&pk, 1);
    pack_str(&pk, "op");
    pack_str(&pk, "infer");
    pack_str(&pk, "model");
    pack_str(&pk, "mlp-light");
    pack_str(&pk, "inputs");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 3);
    pack_str(&pk, "name");
    pack_str(&pk, "x");
    pack_str(&pk, "dtype");
    pack_str(&pk, "float32");
    pack_str(&pk, "shape");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, ROWS);
    msgpack_pack_int(&pk, FEATURES);
}

/* Floats go on the wire little endian whatever the host's byte order. */
static void put_f32_le(unsigned char *out, float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    for (int i = 0; i < 4; i++) out[i] = (unsigned char)(bits >> (8 * i));
}

static float get_f32_le(const unsigned char *in) {
    uint32_t bits = 0;
    for (int i = 0; i < 4; i++) bits |= (uint32_t)in[i] << (8 * i);
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static const msgpack_object *map_get(const msgpack_object *map, const char *key) {
    if (map->type != MSGPACK_OBJECT_MAP) return NULL;
    size_t n = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, key, n) == 0)
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

static void print_str(const char *label, const msgpack_object *s) {
    if (s != NULL && s->type == MSGPACK_OBJECT_STR)
        printf("%s %.*s\n", label, (int)s->via.str.size, s->via.str.ptr);
}

static long long as_int(const msgpack_object *o) {
    if (o == NULL) return -1;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return (long long)o->via.u64;
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) return (long long)o->via.i64;
    return -1;
}

/* Print one output: its spec, then its values if it is float32 and its frame fits the shape. */
static int print_output(const msgpack_object *spec, zmq_msg_t *frame) {
    const msgpack_object *name = map_get(spec, "name"), *dtype = map_get(spec, "dtype"), *shape = map_get(spec, "shape");
    if (name == NULL || name->type != MSGPACK_OBJECT_STR || dtype == NULL || dtype->type != MSGPACK_OBJECT_STR ||
        shape == NULL || shape->type != MSGPACK_OBJECT_ARRAY) {
        fprintf(stderr, "reply: an output spec lacks name, dtype or shape\n");
        return 2;
    }
    size_t elements = 1;
    printf("output %.*s %.*s [", (int)name->via.str.size, name->via.str.ptr, (int)dtype->via.str.size,
           dtype->via.str.ptr);
    for (uint32_t d = 0; d < shape->via.array.size; d++) {
        long long dim = as_int(&shape->via.array.ptr[d]);
        printf("%s%lld", d ? "," : "", dim);
        elements *= dim < 0 ? 0 : (size_t)dim;
    }
    printf("]\n");
    if (dtype->via.str.size != 7 || memcmp(dtype->via.str.ptr, "float32", 7) != 0) return 0;
    if (zmq_msg_size(frame) != elements * 4) {
        fprintf(stderr, "reply: output frame has %zu bytes, its shape needs %zu\n", zmq_msg_size(frame), elements * 4);
        return 2;
    }
    const unsigned char *data = zmq_msg_data(frame);
    for (size_t i = 0; i < elements; i++) printf("value %.9g\n", get_f32_le(data + 4 * i));
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s ENDPOINT [TIMEOUT_MS]\n", argv[0]);
        return 2;
    }
    long timeout_ms = argc == 3 ? strtol(argv[2], NULL, 10) : 5000;

    void *context = zmq_ctx_new();
    void *sock = zmq_socket(context, ZMQ_DEALER);
    int linger = 0;  /* never hang at exit on a request the daemon did not take */
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(sock, argv[1]) != 0) {
        fprintf(stderr, "cannot connect to %s: %s\n", argv[1], zmq_strerror(zmq_errno()));
        return 2;
    }

    msgpack_sbuffer header;
    msgpack_sbuffer_init(&header);
    pack_header(&header);
    unsigned char payload[ROWS * FEATURES * 4];
    for (int i = 0; i < ROWS * FEATURES; i++) put_f32_le(payload + 4 * i, (float)(i - 32) / 32.0f);
    zmq_send(sock, header.data, header.size, ZMQ_SNDMORE);
    zmq_send(sock, payload, sizeof payload, 0);
    msgpack_sbuffer_destroy(&header);

    zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, timeout_ms) <= 0) {
        fprintf(stderr, "no reply within %ld ms\n", timeout_ms);
        zmq_close(sock);
        zmq_ctx_term(context);
        return 2;
    }

    /* Receive every frame of the reply: the header, then one payload per output. */
    zmq_msg_t frames[17];
    int count = 0, more = 1;
    while (more && count < 17) {
        zmq_msg_init(&frames[count]);
        zmq_msg_recv(&frames[count], sock, 0);
        more = zmq_msg_more(&frames[count]);
        count++;
    }

    int rc = 2;
    msgpack_unpacked reply;
    msgpack_unpacked_init(&reply);
    if (msgpack_unpack_next(&reply, zmq_msg_data(&frames[0]), zmq_msg_size(&frames[0]), NULL) ==
            MSGPACK_UNPACK_SUCCESS &&
        reply.data.type == MSGPACK_OBJECT_MAP) {
        const msgpack_object *status = map_get(&reply.data, "status");
        print_str("status", status);
        print_str("error", map_get(&reply.data, "error"));
        const msgpack_object *timing = map_get(&reply.data, "timing_us");
        if (timing != NULL)
            printf("timing_us queue=%lld compute=%lld total=%lld\n", as_int(map_get(timing, "queue")),
                   as_int(map_get(timing, "compute")), as_int(map_get(timing, "total")));
        int ok = status != NULL && status->type == MSGPACK_OBJECT_STR && status->via.str.size == 2 &&
                 memcmp(status->via.str.ptr, "OK", 2) == 0;
        rc = ok ? 0 : 1;
        const msgpack_object *outputs = map_get(&reply.data, "outputs");
        if (ok && outputs != NULL && outputs->type == MSGPACK_OBJECT_ARRAY) {
            for (uint32_t i = 0; i < outputs->via.array.size && rc == 0; i++) {
                if ((int)i + 1 >= count) {
                    fprintf(stderr, "reply: %u outputs but %d payload frames\n", outputs->via.array.size, count - 1);
                    rc = 2;
                } else {
                    rc = print_output(&outputs->via.array.ptr[i], &frames[i + 1]);
                }
            }
        }
    } else {
        fprintf(stderr, "reply: the header is not a msgpack map\n");
    }
    msgpack_unpacked_destroy(&reply);
    for (int i = 0; i < count; i++) zmq_msg_close(&frames[i]);
    zmq_close(sock);
    zmq_ctx_term(context);
    return rc;
}
