"""The node agent (the per-host daemon): :mod:`coorm.node_agent.state` is its pure bookkeeping,
:mod:`coorm.node_agent.agent` the NATS/subprocess shell and the ``coorm agent`` entry point (``main``),
:mod:`coorm.node_agent.nodes` node lists and host info, :mod:`coorm.node_agent.procs` process-group helpers."""
