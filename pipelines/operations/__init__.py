"""Operations without Ray: what the index job and the nightly decide and record.

- ``indexing``: the index job's stages: change detection by content hash, the writer, the
  guards that refuse a snapshot, roll-back;
- ``writelock``: a table's write lease (one writer at a time);
- ``nightly``: a night's state, history, comparison, report and alert;
- ``alerts``: delivering an alert to its webhook and command.

The jobs that run them are jobs/index.py and jobs/nightly.py.
"""
