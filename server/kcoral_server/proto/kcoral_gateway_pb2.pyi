# ruff: noqa
# fmt: off
# Generated from kcoral_gateway.proto by kcoral_server.proto.regenerate.
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SupervisorStatus(_message.Message):
    __slots__ = ("node_id", "server_healthy", "supervisor_instance_id", "server_instance_id", "worker_count", "busy_workers", "target", "versions", "last_error", "health_age_millis", "slot_key", "kind", "labels", "node_metrics", "lease_stats", "draining")
    class TargetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_HEALTHY_FIELD_NUMBER: _ClassVar[int]
    SUPERVISOR_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_COUNT_FIELD_NUMBER: _ClassVar[int]
    BUSY_WORKERS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    HEALTH_AGE_MILLIS_FIELD_NUMBER: _ClassVar[int]
    SLOT_KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NODE_METRICS_FIELD_NUMBER: _ClassVar[int]
    LEASE_STATS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    server_healthy: bool
    supervisor_instance_id: str
    server_instance_id: str
    worker_count: int
    busy_workers: int
    target: _containers.ScalarMap[str, str]
    versions: _containers.ScalarMap[str, str]
    last_error: str
    health_age_millis: int
    slot_key: str
    kind: NodeKind
    labels: _containers.ScalarMap[str, str]
    node_metrics: bytes
    lease_stats: LeaseStats
    draining: bool
    def __init__(self, node_id: _Optional[str] = ..., server_healthy: _Optional[bool] = ..., supervisor_instance_id: _Optional[str] = ..., server_instance_id: _Optional[str] = ..., worker_count: _Optional[int] = ..., busy_workers: _Optional[int] = ..., target: _Optional[_Mapping[str, str]] = ..., versions: _Optional[_Mapping[str, str]] = ..., last_error: _Optional[str] = ..., health_age_millis: _Optional[int] = ..., slot_key: _Optional[str] = ..., kind: _Optional[_Union[NodeKind, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., node_metrics: _Optional[bytes] = ..., lease_stats: _Optional[_Union[LeaseStats, _Mapping]] = ..., draining: _Optional[bool] = ...) -> None: ...

class LeaseStats(_message.Message):
    __slots__ = ("count", "seat_held_mean_ms", "seat_held_p50_ms", "lease_held_mean_ms", "lease_held_p50_ms", "queued")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SEAT_HELD_MEAN_MS_FIELD_NUMBER: _ClassVar[int]
    SEAT_HELD_P50_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_HELD_MEAN_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_HELD_P50_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    count: int
    seat_held_mean_ms: float
    seat_held_p50_ms: float
    lease_held_mean_ms: float
    lease_held_p50_ms: float
    queued: int
    def __init__(self, count: _Optional[int] = ..., seat_held_mean_ms: _Optional[float] = ..., seat_held_p50_ms: _Optional[float] = ..., lease_held_mean_ms: _Optional[float] = ..., lease_held_p50_ms: _Optional[float] = ..., queued: _Optional[int] = ...) -> None: ...

class NodeKind(_message.Message):
    __slots__ = ("gpu", "arch", "memory_bytes", "gpus", "product")
    GPU_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    PRODUCT_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    arch: str
    memory_bytes: int
    gpus: int
    product: str
    def __init__(self, gpu: _Optional[str] = ..., arch: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., gpus: _Optional[int] = ..., product: _Optional[str] = ...) -> None: ...

class SupervisorAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SlotHello(_message.Message):
    __slots__ = ("node_id", "server_instance_id", "slot_id", "protocol_version", "slot_key", "max_control_slots")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SLOT_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTROL_SLOTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    server_instance_id: str
    slot_id: str
    protocol_version: int
    slot_key: str
    max_control_slots: int
    def __init__(self, node_id: _Optional[str] = ..., server_instance_id: _Optional[str] = ..., slot_id: _Optional[str] = ..., protocol_version: _Optional[int] = ..., slot_key: _Optional[str] = ..., max_control_slots: _Optional[int] = ...) -> None: ...

class SlotAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HttpHeader(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    value: bytes
    def __init__(self, name: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class RequestHead(_message.Message):
    __slots__ = ("headers", "content_length")
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    headers: _containers.RepeatedCompositeFieldContainer[HttpHeader]
    content_length: int
    def __init__(self, headers: _Optional[_Iterable[_Union[HttpHeader, _Mapping]]] = ..., content_length: _Optional[int] = ...) -> None: ...

class ResponseHead(_message.Message):
    __slots__ = ("status", "headers")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    status: int
    headers: _containers.RepeatedCompositeFieldContainer[HttpHeader]
    def __init__(self, status: _Optional[int] = ..., headers: _Optional[_Iterable[_Union[HttpHeader, _Mapping]]] = ...) -> None: ...

class EndOfBody(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class SlotFrame(_message.Message):
    __slots__ = ("request_id", "hello", "request_head", "data", "end", "response_head", "cancel", "ack")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HEAD_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_HEAD_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    hello: SlotHello
    request_head: RequestHead
    data: bytes
    end: EndOfBody
    response_head: ResponseHead
    cancel: Cancel
    ack: SlotAck
    def __init__(self, request_id: _Optional[str] = ..., hello: _Optional[_Union[SlotHello, _Mapping]] = ..., request_head: _Optional[_Union[RequestHead, _Mapping]] = ..., data: _Optional[bytes] = ..., end: _Optional[_Union[EndOfBody, _Mapping]] = ..., response_head: _Optional[_Union[ResponseHead, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., ack: _Optional[_Union[SlotAck, _Mapping]] = ...) -> None: ...
