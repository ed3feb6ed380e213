"""Data for the BridgeTower workload: sources of (image bytes, caption) pairs and the torch loader."""
