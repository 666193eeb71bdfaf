"""The wire codec's former address, kept for code that imports `edged.protocol`
(raw clients, tools, tests). The codec itself lives in `edged.wire.codec`."""

from edged.wire.codec import (
    MAX_DEADLINE_MS,
    MAX_ID_BYTES,
    OPS,
    PROTOCOL_VERSION,
    Buffer,
    Limits,
    ProtocolError,
    Reply,
    Request,
    RequestId,
    Status,
    TensorSpec,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
    tensor_views,
)
from edged.wire.tensors import DTYPES

__all__ = [
    "DTYPES",
    "MAX_DEADLINE_MS",
    "MAX_ID_BYTES",
    "OPS",
    "PROTOCOL_VERSION",
    "Buffer",
    "Limits",
    "ProtocolError",
    "Reply",
    "Request",
    "RequestId",
    "Status",
    "TensorSpec",
    "decode_reply",
    "decode_request",
    "encode_reply",
    "encode_request",
    "tensor_views",
]
