"""What the command line (``cli/``) and the dashboard (``dashboard/``) both do to Redis, without
typer, rich or Jinja2: connect to a server, a Cluster or a Sentinel-managed primary (``connect``),
read queues as an operator sees them (``reads``), find queues by ``SCAN`` (``scan``), and write a
duration for people (``durations``). Every read here is bounded; the only writes are the queue's own
calls that a command or a dashboard button makes."""
