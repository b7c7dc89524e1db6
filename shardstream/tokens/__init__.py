"""Text for language models: token shards (:mod:`.format`), packed from documents
(:func:`pack_tokens`) or imported from Megatron and datatrove files, read as fixed-length
token blocks (:class:`~shardstream.tokens.blocks.TokenBlockUnit`, and the torch dataset
``TokenBlocks`` in :mod:`shardstream.blocks`). docs/tokens.md tells the whole story."""

from .docids import DOCIDS_DIR, TokenIds, build_docid_index, get_document
from .format import TOKENS_INDEX_NAME, TokenIndex, TokenManifest, TokenShardRow, token_dtype, token_shard_pieces
from .imports import ImportReport, import_datatrove, import_megatron
from .pack import pack_tokens

__all__ = [
    "DOCIDS_DIR",
    "TOKENS_INDEX_NAME",
    "ImportReport",
    "TokenIds",
    "TokenIndex",
    "TokenManifest",
    "TokenShardRow",
    "build_docid_index",
    "get_document",
    "import_datatrove",
    "import_megatron",
    "pack_tokens",
    "token_dtype",
    "token_shard_pieces",
]
