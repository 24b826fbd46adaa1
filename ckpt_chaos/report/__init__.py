"""What a suite run leaves: results.json, CSV and JUnit, the HTML report and its plots, goodput."""
