"""The anonymizing shuffler tier (``ptt shuffler``): device reports in, permuted columnar
batches and end-of-epoch markers out. :mod:`.policy` is pure; :mod:`.runtime` is the Kafka loop
(transactions); :mod:`.settings` its configuration."""
