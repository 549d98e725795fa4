"""Recurring items (``DelayedQueue.schedule``): the schedule call (``schedules``), cron expressions and
their next times (``cron``), and the refill a consumer runs when it takes a cron occurrence
(``refill``). The scripts are ``schedule.lua``, ``refill.lua`` and ``lib/recur.lua``; a sharded queue's
composite is ``_sharding/keyed.py``'s ``ShardedSchedules``."""
