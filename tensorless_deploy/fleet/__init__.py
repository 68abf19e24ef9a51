"""Layer 8, the fleet: inventories, parallel surveys, deploy, push, status and stop over SSH."""
