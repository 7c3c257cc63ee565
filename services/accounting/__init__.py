"""Accounting (DESIGN §2): a durable record of every allocation's life, read from the lifecycle stream,
and usage roll-ups by user and application (Celery tasks)."""
