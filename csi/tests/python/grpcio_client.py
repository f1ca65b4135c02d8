"""Drives the plugin's Identity and Node services from PyPI's grpcio (grpc-core), with the
channel's default options: for unix:///PATH grpc-core sends the percent-encoded path as
:authority. No protobuf package: requests are empty messages, and the few fields the test
checks are read from the wire format here.

Usage: python grpcio_client.py SOCKET_PATH; prints one JSON object.
"""

import json
import sys

import grpc


def varint(buf, i):
    value, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    """The (number, value) pairs of a message: varints as ints, length-delimited as bytes."""
    out, i = [], 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 2:
            n, i = varint(buf, i)
            value, i = bytes(buf[i:i + n]), i + n
        else:
            raise ValueError(f"wire type {wire}")
        out.append((number, value))
    return out


def main():
    channel = grpc.insecure_channel(f"unix://{sys.argv[1]}")

    def call(method):
        stub = channel.unary_unary(method)
        return stub(b"", timeout=60)

    probe = call("/csi.v1.Identity/Probe")
    info = dict(fields(call("/csi.v1.Identity/GetPluginInfo")))
    caps = []
    for number, cap in fields(call("/csi.v1.Node/NodeGetCapabilities")):
        rpc = dict(fields(cap)).get(1, b"")
        caps.append(dict(fields(rpc)).get(1, 0))
    node = dict(fields(call("/csi.v1.Node/NodeGetInfo")))
    print(json.dumps({
        "probe": probe.hex(),
        "name": info.get(1, b"").decode(),
        "node_capabilities": caps,
        "node_id": node.get(1, b"").decode(),
        "max_volumes": node.get(2, 0),
        "grpc_version": grpc.__version__,
    }))


if __name__ == "__main__":
    main()
