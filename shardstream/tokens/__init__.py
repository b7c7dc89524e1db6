"""Text for language models: token shards (:mod:`.format`), packed from documents
(:func:`pack_tokens`) or imported from Megatron and datatrove files, read as fixed-length
token blocks (:class:`~shardstream.tokens.blocks.TokenBlockUnit`, and the torch dataset
``TokenBlocks`` in :mod:`shardstream.blocks`). docs/tokens.md tells the whole story."""

from .format import TOKENS_INDEX_NAME, TokenIndex, TokenManifest, TokenShardRow, token_dtype, token_shard_pieces

__all__ = ["TOKENS_INDEX_NAME", "TokenIndex", "TokenManifest", "TokenShardRow", "token_dtype", "token_shard_pieces"]
