"""Prompts and answers: the prompt templates (`prompts`), the answer parsers shared by rewards and eval (`parsing`), the rewards and their registry (`rewards`)."""
