"""The write-ahead log: framing (``frame``), appending (``writer``), reading (``reader``)."""

from .frame import Frame, SegmentHeader
from .reader import Scan, SegmentFile, list_segments, scan_segment
from .writer import PendingRecord, Segment, Writer

__all__ = [
    "Frame",
    "PendingRecord",
    "Scan",
    "Segment",
    "SegmentFile",
    "SegmentHeader",
    "Writer",
    "list_segments",
    "scan_segment",
]
