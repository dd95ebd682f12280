"""The program layer: a configuration -> its step on one device or a mesh, lowered, compiled and timed."""
