"""The reading half: shards -> batches of samples, for :class:`shardstream.dataset.ShardDataset`.

- :mod:`.assign`: who we are (rank, world_size, worker_id, num_workers) and, for bare shard
  URLs, which shards each reader reads;
- :mod:`.plan`: exact epochs: the epoch's samples cut into equal parts per rank and worker,
  each a list of shard runs with its lanes' interleaving and shuffle-buffer order;
- :mod:`.schedule`: the epoch schedule: shard order, plan, ``len`` and checkpoint state;
- :mod:`.epochs`: which epoch each pass reads, shared with DataLoader workers;
- :mod:`.shards`: the small interface the engine reads shards through;
- :mod:`.engine`: a plan in, batches out: runs fetched, sliced or parsed, interleaved;
- :mod:`.slicer`: members cut at the index's offsets; :mod:`.stats`: reader metrics.

Nothing here imports torch at import time (:func:`.assign.current_slot` asks torch inside),
nor :mod:`shardstream.packing`.
"""
