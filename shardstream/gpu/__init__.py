"""Batched GPU loading: the decoder-independent half of a GPU loader (fields, feed, skip,
fallback, lifecycle), which a GPU decoder's graph plugs into (:mod:`shardstream.dali`)."""
