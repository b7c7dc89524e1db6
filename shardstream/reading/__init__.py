"""The reading half: shards -> batches of items, for :class:`shardstream.dataset.ShardDataset`.

- :mod:`.assign`: who we are (rank, world_size, worker_id, num_workers) and, for bare shard
  URLs, which shards each reader reads;
- :mod:`.plan`, :mod:`.mixplan`: exact epochs: the epoch's items cut into equal parts per
  rank and worker, each a list of shard runs with its lanes' interleaving and shuffle-buffer
  order (a mixture's per source);
- :mod:`.schedule`: the epoch schedule: shard order, plan, ``len`` and checkpoint state; a
  dataset is a mixture of one (``schedule_for``), refusals in one place (``refused``);
- :mod:`.epochs`: which epoch each pass reads, shared with DataLoader workers;
- :mod:`.shards`: the small interface the engine reads shards through;
- :mod:`.engine`: a plan in, batches out: runs fetched, sliced or parsed, interleaved;
- :mod:`.stages`: the stage list of a pass and the item unit; :mod:`.reader`: a pass composed
  of them; :mod:`.front`: what a dataset object shows of its reader (settings, random
  access, epochs and checkpoints);
- :mod:`.slicer`: members cut at the index's offsets; :mod:`.stats`: reader metrics.

Nothing here imports torch, not even lazily (an import-linter contract): :mod:`.assign` asks
a torch the process already loaded (a DataLoader worker, a torchrun job) through
``sys.modules``; nor :mod:`shardstream.packing`.
"""
