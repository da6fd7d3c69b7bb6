"""The wire contract: frozen pydantic models and their encodings. JSON Schema for subscribers."""

from .query import MECHANISM_NAMES, Query, QueryMechanism
from .wire import (
    MAGIC,
    MAX_MARKERS_PER_SET,
    ArraySpec,
    BatchHeader,
    DecodedBatch,
    EndOfEpoch,
    EndOfEpochSet,
    GroundTruth,
    SingleReport,
    WireError,
    decode_record,
    encode_batch,
    encode_json,
    json_safe,
    json_schemas,
    new_batch_id,
)

__all__ = [
    "MAGIC",
    "MECHANISM_NAMES",
    "ArraySpec",
    "BatchHeader",
    "DecodedBatch",
    "MAX_MARKERS_PER_SET",
    "EndOfEpoch",
    "EndOfEpochSet",
    "GroundTruth",
    "Query",
    "QueryMechanism",
    "SingleReport",
    "WireError",
    "decode_record",
    "encode_batch",
    "encode_json",
    "json_safe",
    "json_schemas",
    "new_batch_id",
]
