"""Chat prompts shared by the real-pair experiments (the profile of repro_60_decoding.py and decode_real_pair.py)."""

#: Instruction-style prompts, formatted with the model's chat template by each experiment.
CHAT_PROMPTS = [
    "Explain why the sky is blue.",
    "Write a short story about a robot learning to paint.",
    "List three tips for learning Python.",
    "What is the boiling point of water at sea level?",
    "Describe the water cycle in simple terms.",
    "Give me a recipe for pancakes.",
    "What are the benefits of regular exercise?",
    "Summarise the plot of Romeo and Juliet.",
    "How do airplanes stay in the air?",
    "Write a haiku about autumn leaves.",
    "What is the difference between weather and climate?",
    "Suggest a name for a coffee shop and explain it.",
    "How does a refrigerator keep food cold?",
    "Give two arguments for and against homework.",
    "Explain what a black hole is.",
    "Write a polite email declining a meeting invitation.",
    "What causes the seasons on Earth?",
    "Describe how to plant a tree.",
    "Why do cats purr?",
    "Explain compound interest with an example.",
    "Write a limerick about a forgetful wizard.",
    "What are the main parts of a cell?",
    "Give advice for a first job interview.",
    "How do vaccines work?",
]
