"""Local SGD: workers step alone and average parameters every H steps; its worker, config section, cost terms."""
