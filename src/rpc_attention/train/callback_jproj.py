"""Registers the ``jproj`` epoch-end callback (owned by the analysis toolkit, rpc_attention.kpca)."""

from ..kpca.callbacks import register

register()
