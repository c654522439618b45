"""What a gather costs: the memory timeline of each unit's gather, predicted and measured."""
