"""The fleet: a host's heartbeat into a shared PostgreSQL store, and the view of the fleet's
hosts and lease holders that ``mcplive status`` and the console show.

May import: the root of :mod:`actors` below Host, :mod:`protocol`, :mod:`store`.
Never imported by: the root modules or :mod:`actors.serverkit`; :mod:`actors.host` starts the
heartbeat, :mod:`actors.cli` and :mod:`actors.web` read the view.
"""
