"""Read here by walj/cli until it imports these from walj.journal.records."""

from .records import decode_record, show, time_of, turn_number

__all__ = ["decode_record", "show", "time_of", "turn_number"]
