"""The toolkit's cookbook: short servers written with :mod:`actors.serverkit`, each a file to
copy and run on its own (``python webhook.py``, ...): a webhook into a channel, reminders that
survive restarts, a plain tool server and a relay between two channels. Not installed."""
