#!/bin/sh
# needs: units.sh
# Every unit tensorless-deploy wrote on this host and what runs from it, for status, stop, logs,
# bench, rollback and prune (facts.pyinfra.DeployedUnits): units.sh's blocks, with the running
# containers (and /metrics where secrets_root is given).
read_units
