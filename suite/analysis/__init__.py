"""Reading results: scoring repeats, comparing configurations, published ratios, audits, worker tuning, plots."""
