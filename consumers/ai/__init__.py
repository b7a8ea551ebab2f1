"""The AI client and what paces its calls: retries, the endpoint's circuit, the adaptive limit,
the rate budget."""
