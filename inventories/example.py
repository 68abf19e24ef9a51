"""An example pyinfra inventory for tensorless-deploy.

Any pyinfra inventory works (https://docs.pyinfra.com/en/3.x/inventory-data.html): module-level
lists of hosts are groups; a host is a name, or (name, data). pyinfra's own keys (ssh_hostname,
ssh_user, ssh_key, ssh_port, ssh_known_hosts_file, ...) say how to reach it; these keys say how
tensorless-deploy serves on it, each with its default:

    tensorless_port        8080                          the API port
    tensorless_bind        "127.0.0.1"                   the API address; say "0.0.0.0" to open
                                                          it to the network (the default never does)
    tensorless_models_dir  "/var/lib/tensorless/models"  where GGUFs land, in the Hugging Face
                                                          cache layout (models--ORG--NAME/...)
    tensorless_engine      "auto"                        "podman", "docker", or auto (podman
                                                          when present, else docker)
    tensorless_gpus        (read over SSH)               for `plan --offline` only: the GPUs as
                                                          nvidia-smi would list them
    tensorless_instances   "all"                         one llama-server per matching card:
                                                          "all", a count, or GPU indices/UUIDs
    tensorless_ports       (port + 0, 1, ...)            one port per instance, instead of
                                                          tensorless_port + its ordinal
    tensorless_toolkit_version  (the newest)             for `prepare`: pin the NVIDIA Container
                                                          Toolkit, e.g. "1.17.8-1"
    tensorless_toolkit_repo  "https://nvidia.github.io/libnvidia-container"
                                                          for `prepare`: its package repository
                                                          (or a mirror with the same layout)
    tensorless_toolkit_key   "<repo>/gpgkey"             for `prepare`: the repository's key
    tensorless_api_key_file  (none)                      a file ON THIS MACHINE holding one API
                                                          key (openssl rand -hex 32 > api.key);
                                                          callers send "Authorization: Bearer
                                                          KEY", /health needs none; installed
                                                          on the host for root only
    tensorless_insecure_open  False                      True: a bind beyond 127.0.0.1 without
                                                          a key (refused otherwise)
    tensorless_tls_cert_file  (none)                     PEM certificate and key on this
    tensorless_tls_key_file   (none)                      machine: llama-server serves https
    tensorless_metrics      False                         llama-server's /metrics (with the key)
    tensorless_pids_limit   4096                          the container's pids limit; 0: none
                                                          (hosts whose cgroups lack pids)
    tensorless_host_timeout  60                          seconds the host may be silent over
                                                          SSH (connect, any step) before a run
                                                          calls it unreachable (--host-timeout)
    tensorless_cors_origins "localhost"                   browser origins that may read the
                                                          API's answers: loopback pages only;
                                                          "https://ui.example.net,..." names
                                                          others; "*" only with a key
    tensorless_drain_timeout  60                          seconds a restart or stop waits for
                                                          the instance's requests in flight
                                                          (/slots idle); 0: none (--drain-timeout)
    tensorless_relay          false                       true: a push to this host comes from a
                                                          host holding the bytes verified, the
                                                          controller sending only while none
                                                          does; a pull of the model too, one
                                                          host downloading it if none holds
                                                          it (--relay)

A tensorless_* key not listed here is refused, naming the nearest one (a typo never leaves the
default in place without a word).

Use it with:  tensorless-deploy doctor -i inventories/example.py [MODEL]
              tensorless-deploy prepare -i inventories/example.py --dry-run
"""

# Pascal boxes reached directly, key from ssh-agent or ~/.ssh/config.
p100_servers = [
    ("gpu-p100-01.example.net", {"ssh_user": "root"}),
    ("gpu-p100-02.example.net", {"ssh_user": "root", "tensorless_port": 8081}),
]

# A Hopper box behind its own address, serving to the LAN on purpose, models on a big disk.
h200_servers = [
    (
        "h200-a",
        {
            "ssh_hostname": "10.0.12.7",
            "ssh_user": "ubuntu",
            "_sudo": True,
            "tensorless_bind": "0.0.0.0",
            # beyond loopback the API needs a key: this file on the controller, never the key
            "tensorless_api_key_file": "~/.config/tensorless/h200-a.key",
            "tensorless_metrics": True,
            "tensorless_models_dir": "/srv/models",
            "tensorless_toolkit_version": "1.17.8-1",  # what `prepare` installs, pinned
            # What `plan --offline` assumes before the host is reachable:
            "tensorless_gpus": [
                {
                    "name": "NVIDIA H200",
                    "compute_cap": "9.0",
                    "memory_total_mib": 143771,
                    "driver_version": "580.159.04",
                },
            ],
        },
    ),
]
