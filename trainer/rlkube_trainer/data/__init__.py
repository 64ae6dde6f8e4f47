"""The prompts a run trains and validates on: reading and checking the dataset files, the
loader's order and position, and preparing datasets into that format."""
