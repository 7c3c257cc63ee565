"""The node agent (the per-host daemon): :mod:`node_agent.state` is its pure bookkeeping,
:mod:`node_agent.agent` the NATS/subprocess shell and the ``coorm agent`` entry point (``main``),
:mod:`node_agent.nodes` node lists and host info, :mod:`node_agent.procs` process-group helpers."""
