"""The text front-end: normalization as upstream ChatTTS does it, and long-input splitting."""
