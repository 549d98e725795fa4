"""What a queue holds, read and edited without consuming it: its contents (sizes, counts, peeks,
walks, removals, ``clear``; ``contents.py``, ``counts.py``) and its dead letters (``dead_letters.py``)."""
