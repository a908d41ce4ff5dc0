"""Leases of a fleet: which agents run on this host when several hosts share one store.

Owns the host's lease keeper (:mod:`actors.leasing.keeper`): on a PostgreSQL store it steps the
lease table every :data:`protocol.leases.RENEW_S`, starts the agent actors whose leases this host
takes and stops those it lets go, loses, or cannot renew in time. On the embedded store there is
no keeper: every configured agent runs.

May import: :mod:`actors.agent` (it starts and stops agent actors), the wings below it, the root
of :mod:`actors` below Host, :mod:`protocol`, :mod:`store`.
Never imported by: any wing but :mod:`actors.cli` and :mod:`actors.web`; :mod:`actors.host`
opens the keeper.
"""
