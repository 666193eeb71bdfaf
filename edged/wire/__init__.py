"""The wire: protocol version 1's codec, tensors as views of their frames, and a
request checked against a model's signature. Pure code, no sockets; shared with the clients.
"""
