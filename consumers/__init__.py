"""The pipeline runtime: producers, AI consumers, AI client, AI service stand-in, storage."""
