"""The stream-app worker tier (``ptt worker``): reports in (the shuffler's release, or the
replay's batches), estimates out. :mod:`.app` is the Faust runtime (read, call the pure parts,
write, emit); stage 1 is :mod:`.decode`, stage 2 :mod:`.windows`, :mod:`.stage2` and
:mod:`.estimate`; :mod:`.publish`, :mod:`.frames` and :mod:`.metrics` put the estimates out."""
