"""A fast path for ``SlotFrame`` ``data`` frames on both ends of a slot (ROUTER.md §2, §5).

Bodies cross a slot as 256 KiB ``data`` frames. Building a protobuf message per frame
copies the body into an arena and out again (and a fresh 256 KiB arena per frame costs
page faults), so data frames are written and read at the wire level instead:

* ``encode_data`` builds the serialized ``SlotFrame{request_id, data}`` with one join;
  ``serialize_frame`` (the gRPC serializer) passes such bytes through and serializes
  ordinary messages as usual. The bytes on the wire are exactly what protobuf writes.
* ``parse_frame`` / ``parse_frame_view`` (gRPC deserializers) recognise a frame that holds
  only ``request_id`` and ``data`` and return a ``DataFrame`` with the same read interface
  (``request_id``, ``data``, ``WhichOneof``, ``HasField``); anything else, malformed input
  included, goes through ``SlotFrame.FromString`` unchanged.
"""

from __future__ import annotations

import grpc

from kcoral_server.proto import kcoral_gateway_pb2 as pb

#: Field keys (field number << 3 | wire type 2) of ``SlotFrame.request_id`` and ``data``.
REQUEST_ID_KEY, DATA_KEY = 0x0A, 0x22
SERVICE = "kcoral.gateway.v1.RouterGateway"
CONNECT_SLOT = f"/{SERVICE}/ConnectSlot"


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_data(request_id: str, data: bytes | memoryview) -> bytes:
    """The serialized ``SlotFrame(request_id=request_id, data=data)``."""
    rid = request_id.encode()
    head = (bytes((REQUEST_ID_KEY,)) + varint(len(rid)) + rid if rid else b"") + bytes((DATA_KEY,))
    return b"".join((head, varint(len(data)), data))


def serialize_frame(frame: pb.SlotFrame | bytes) -> bytes:
    """gRPC serializer: bytes from ``encode_data`` as they are, messages serialized."""
    if isinstance(frame, bytes):
        return frame
    return frame.SerializeToString()


class DataFrame:
    """A parsed ``data`` frame, read like a ``SlotFrame`` whose payload is ``data``."""

    __slots__ = ("data", "request_id")

    def __init__(self, request_id: str, data: bytes | memoryview) -> None:
        self.request_id = request_id
        self.data = data

    # Named like protobuf's methods so code reading frames takes either kind.
    def WhichOneof(self, name: str) -> str | None:
        return "data" if name == "payload" else None

    def HasField(self, name: str) -> bool:
        return name in ("data", "payload")


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    """``(value, next position)``; raises IndexError past the end or ValueError if too long."""
    value, shift = 0, 0
    while True:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 35:
            raise ValueError("varint too long")


def _split_data_frame(raw: bytes) -> tuple[str, int, int] | None:
    """``(request_id, data start, data end)`` if ``raw`` is exactly a data frame, else None."""
    request_id = ""
    data: tuple[int, int] | None = None
    seen_id = False
    pos, size = 0, len(raw)
    try:
        while pos < size:
            key = raw[pos]
            if key not in (REQUEST_ID_KEY, DATA_KEY):
                return None
            length, start = _read_varint(raw, pos + 1)
            end = start + length
            if end > size:
                return None
            if key == REQUEST_ID_KEY:
                if seen_id:
                    return None
                seen_id = True
                request_id = raw[start:end].decode("utf-8")
            else:
                if data is not None:
                    return None
                data = (start, end)
            pos = end
    except (IndexError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    if data is None:
        return None
    return request_id, data[0], data[1]


def parse_frame(raw: bytes) -> pb.SlotFrame | DataFrame:
    """gRPC deserializer; a data frame's ``data`` is ``bytes`` (Tornado writes only bytes)."""
    if raw[:1] in (b"\x0a", b"\x22") and len(raw) > 1024:
        parts = _split_data_frame(raw)
        if parts is not None:
            return DataFrame(parts[0], raw[parts[1] : parts[2]])
    return pb.SlotFrame.FromString(raw)


def parse_frame_view(raw: bytes) -> pb.SlotFrame | DataFrame:
    """gRPC deserializer; a data frame's ``data`` is a ``memoryview`` into ``raw`` (no copy)."""
    if raw[:1] in (b"\x0a", b"\x22") and len(raw) > 1024:
        parts = _split_data_frame(raw)
        if parts is not None:
            return DataFrame(parts[0], memoryview(raw)[parts[1] : parts[2]])
    return pb.SlotFrame.FromString(raw)


#: The node's side of a ``ConnectSlot`` stream.
SlotCall = grpc.aio.StreamStreamCall[pb.SlotFrame | bytes, pb.SlotFrame | DataFrame]


def connect_slot_callable(
    channel: grpc.aio.Channel,
) -> grpc.aio.StreamStreamMultiCallable[pb.SlotFrame | bytes, pb.SlotFrame | DataFrame]:
    """``ConnectSlot`` on ``channel`` with the fast-path (de)serializers (node side)."""
    return channel.stream_stream(
        CONNECT_SLOT,
        request_serializer=serialize_frame,
        response_deserializer=parse_frame_view,
        # grpcio takes it since 1.63 (its generated stubs pass it); types-grpcio lacks it
        _registered_method=True,  # type: ignore[call-arg]
    )
