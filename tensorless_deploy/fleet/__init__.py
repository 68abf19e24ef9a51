"""Layer 9, the fleet: inventories, parallel surveys, deploy, push, status and day two over SSH."""
