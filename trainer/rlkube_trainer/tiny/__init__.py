"""The tiny task the demo and the tests train: a random-initialised model small enough for a
CPU, its prompts and its reward, written to a folder; nothing is downloaded."""
