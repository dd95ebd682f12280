"""The model layer: NNX blocks, stacks of blocks (scan or loop) and the checkpoint-policy registry."""
