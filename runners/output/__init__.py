"""What a run writes besides the store: its record's fields, console table, loggers."""
