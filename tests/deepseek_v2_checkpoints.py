"""The tiny DeepSeek-V2 checkpoints (tests/deepseek_checkpoints.py's V2_VARIANTS) as the module
scripts/make_deepseek_v2_fixtures.py and tests/test_deepseek_v2.py read: VARIANTS, REFERENCE,
write_checkpoint."""
from .deepseek_checkpoints import REFERENCE_V2 as REFERENCE
from .deepseek_checkpoints import V2_VARIANTS as VARIANTS
from .deepseek_checkpoints import write_checkpoint

__all__ = ["REFERENCE", "VARIANTS", "write_checkpoint"]
