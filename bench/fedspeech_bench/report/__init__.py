"""What the benchmarks report: statistics over runs, markdown tables, plots and results files."""
