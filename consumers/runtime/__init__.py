"""What a fleet process runs: a stage's fleet and its members, the stages' steps, outputs,
offsets and storage."""
