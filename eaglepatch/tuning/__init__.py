"""The tuning hunt: ``bench`` and ``sweep``.

- ``load``: a fixed, seeded load against a server's ``/generate`` (the client side of ``bench``).
- ``sweep``: the grid of a sweep: its flags, axes, points and run order; ``cmdline``: the command line of a point;
  ``sweep_state``: the resumable state file; ``sweep_summary``: the summary (JSON, table, CSV).
- ``chart``: the sweep's chart and ``report --compare``'s (SVG; PNG with the plot extra).
- ``drive``: carrying them out on a target: bench through a forwarded port, a sweep's restarts, putting the server
  back.
"""
