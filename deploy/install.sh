#!/usr/bin/env bash
# Install fedspeech on a device running Raspberry Pi OS or Debian 12 (aarch64 or x86_64), as root, with
# the unit files of deploy/ next to this script:
#
#   deploy/install.sh [--listen-only] [--wheel FILE | --index-url URL] [--coordinator URL] [--broker URL]
#                     [--device-id ID] [--enrolment-secret FILE] [--enrol-dir DIR] [--data DIR]
#                     [--torch-index URL] [--root DIR | --prefix DIR]
#
#   (default)            a device that trains: fedspeech[train,audio] with torch==2.13.0, and the unit
#                        fedspeech-client.service
#   --listen-only        a device that only runs the global model: fedspeech[audio], no torch, and the
#                        unit fedspeech-listen.service
#   --wheel FILE         install this wheel (python3 -m build --wheel); else fedspeech from the index
#   --index-url URL      pip's package index for fedspeech and its dependencies (default: pip's own)
#   --torch-index URL    where torch comes from (default https://download.pytorch.org/whl/cpu: PyPI's
#                        Linux torch 2.13.0 wheels are CUDA builds that pull in gigabytes of CUDA)
#   --coordinator URL, --broker URL, --device-id ID, --data DIR
#                        written to /etc/default/fedspeech-client (or -listen); ID defaults to the
#                        host name, DIR to /var/lib/fedspeech/data
#   --enrolment-secret FILE
#                        the device's secret from `fedspeech devices add`, to /etc/fedspeech
#   --enrol-dir DIR      the folder made on the coordinator (DEVICES.md, "Enrolling a device"): its
#                        ca.crt, coordinator.pub, enrolment-secret, broker-password, listen-password
#   --root DIR           install into the Debian system rooted at DIR (a chroot, a mounted SD card),
#                        running apt-get, useradd, python3 and pip inside it (mount DIR/proc first)
#   --prefix DIR         install under DIR with this machine's python3, without apt-get, user or
#                        systemctl (a staging tree, or a test)
#
# Installs apt packages (python3-venv, libportaudio2, libsndfile1, ca-certificates), a system user
# `fedspeech` (group audio), a venv in /opt/fedspeech, configuration in /etc/fedspeech (secrets mode 0600,
# owned by root: the units hand them to the service as systemd credentials) and the unit, enabled; it is
# started where systemd runs and the configuration is complete. Running it again changes only what differs.
set -euo pipefail

TORCH=torch==2.13.0
VENV=/opt/fedspeech
CONF=/etc/fedspeech
STATE=/var/lib/fedspeech
HERE=$(cd "$(dirname "$0")" && pwd)

die() {
    echo "install.sh: $*" >&2
    exit 1
}

say() {
    echo "install.sh: $*"
}

usage() {
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"
}

listen_only=false wheel="" index_url="" torch_index=https://download.pytorch.org/whl/cpu
coordinator="" broker="" device_id="" data="" secret="" enrol_dir="" root="" prefix=""
while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --listen-only) listen_only=true; shift; continue ;;
        --wheel | --index-url | --torch-index | --coordinator | --broker | --device-id | --data | \
            --enrolment-secret | --enrol-dir | --root | --prefix)
            [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value" ;;
        *) die "unknown option $1 (--help lists them)" ;;
    esac
    case $1 in
        --wheel) wheel=$2 ;;
        --index-url) index_url=$2 ;;
        --torch-index) torch_index=$2 ;;
        --coordinator) coordinator=$2 ;;
        --broker) broker=$2 ;;
        --device-id) device_id=$2 ;;
        --data) data=$2 ;;
        --enrolment-secret) secret=$2 ;;
        --enrol-dir) enrol_dir=$2 ;;
        --root) root=$(realpath -m "$2") ;;
        --prefix) prefix=$(realpath -m "$2") ;;
    esac
    shift 2
done

[[ -z $root || -z $prefix ]] || die "give --root or --prefix, not both"
[[ -z $root || -x $root/bin/sh ]] || die "--root $root holds no system (no bin/sh)"
[[ -z $wheel || -f $wheel ]] || die "no wheel file $wheel"
[[ -z $wheel || $wheel == *.whl ]] || die "$wheel is not a wheel (*.whl)"
[[ -z $secret || -f $secret ]] || die "no enrolment secret file $secret"
[[ -z $enrol_dir || -d $enrol_dir ]] || die "no folder $enrol_dir"
[[ -n $prefix || $EUID -eq 0 ]] || die "run it as root (or with --prefix DIR)"
if [[ $device_id == coordinator || $device_id == homeassistant || $device_id == *-listen || $device_id == */* ]]; then
    die "a device id must not be 'coordinator' or 'homeassistant', end in -listen or hold a /"
fi

dest=${root:-$prefix}   # where files go, seen from here
venv=$prefix$VENV       # the venv, seen by the commands that run in the target
if $listen_only; then
    unit=fedspeech-listen.service defaults=/etc/default/fedspeech-listen extras=audio
else
    unit=fedspeech-client.service defaults=/etc/default/fedspeech-client extras=train,audio
fi
[[ -f $HERE/$unit ]] || die "no $unit next to this script in $HERE"

in_target() {  # run a command in the target system: inside --root (with its own environment), or here
    if [[ -n $root ]]; then
        local keep=()
        for name in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
            [[ -z ${!name:-} ]] || keep+=("$name=${!name}")
        done
        chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            HOME=/root LANG=C.UTF-8 "${keep[@]}" "$@"
    else
        "$@"
    fi
}

# 1. apt packages, only where one is missing (apt-get update is slow on a Pi)
packages=(python3-venv libportaudio2 libsndfile1 ca-certificates)
if [[ -n $prefix ]]; then
    say "--prefix: not installing apt packages (${packages[*]})"
else
    missing=()
    for package in "${packages[@]}"; do
        # shellcheck disable=SC2016 # dpkg's format, not the shell's
        status=$(in_target dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
        [[ $status == "install ok installed" ]] || missing+=("$package")
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        say "apt-get install ${missing[*]}"
        in_target env DEBIAN_FRONTEND=noninteractive apt-get update -q
        in_target env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
fi

in_target python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "fedspeech needs Python 3.11 or newer (Debian 12, Raspberry Pi OS 12 'bookworm')"

# 2. the service user, in group audio for the microphone
if [[ -n $prefix ]]; then
    say "--prefix: not creating user fedspeech"
elif ! in_target id -u fedspeech >/dev/null 2>&1; then
    say "adding system user fedspeech"
    in_target useradd --system --user-group --groups audio --home-dir "$STATE" --create-home \
        --shell /usr/sbin/nologin fedspeech
fi

# 3. the venv and fedspeech in it
if [[ ! -x $dest$VENV/bin/python ]]; then
    say "creating the venv $VENV"
    in_target python3 -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --no-input --disable-pip-version-check)
if ! $listen_only; then
    # first, from the torch index: the wheel's own pin (train = torch==2.13.0) is then already met
    say "pip install $TORCH from $torch_index"
    in_target "${pip[@]}" --index-url "$torch_index" "$TORCH"
fi
index=()
[[ -z $index_url ]] || index=(--index-url "$index_url")
if [[ -n $wheel ]]; then
    # a copy inside the target, kept for the next run; pip reads the version from the file name
    install -D -m 644 "$wheel" "$dest$STATE/wheels/$(basename "$wheel")"
    requirement="$prefix$STATE/wheels/$(basename "$wheel")[$extras]"
else
    requirement="fedspeech[$extras]"
fi
say "pip install $requirement"
in_target "${pip[@]}" "${index[@]}" "$requirement"

# 4. configuration: public files 0644, secrets 0600 and root's own
install -d -m 755 "$dest$CONF" "$dest/etc/default"
put() {  # put MODE SOURCE NAME
    if ! cmp -s "$2" "$dest$CONF/$3"; then
        say "$CONF/$3"
        install -m "$1" "$2" "$dest$CONF/$3"
    fi
}
[[ -z $secret ]] || put 600 "$secret" enrolment-secret
if [[ -n $enrol_dir ]]; then
    for name in ca.crt coordinator.pub; do
        [[ ! -f $enrol_dir/$name ]] || put 644 "$enrol_dir/$name" "$name"
    done
    for name in enrolment-secret broker-password listen-password; do
        [[ ! -f $enrol_dir/$name ]] || put 600 "$enrol_dir/$name" "$name"
    done
fi

setting() {  # setting KEY VALUE: set KEY=VALUE in the unit's defaults file, keeping its other lines
    local file=$dest$defaults
    if ! grep -qxF "$1=$2" "$file"; then
        grep -v "^$1=" "$file" >"$file.new" 2>/dev/null || true
        echo "$1=$2" >>"$file.new"
        chmod 644 "$file.new"
        mv "$file.new" "$file"
    fi
}
[[ -z $device_id ]] || setting DEVICE_ID "$device_id"
[[ -z $coordinator ]] || setting COORDINATOR "$coordinator"
[[ -z $broker ]] || setting BROKER "$broker"
if ! $listen_only; then
    [[ -n $data ]] || grep -q '^DATA=' "$dest$defaults" 2>/dev/null || data=$STATE/data
    [[ -z $data ]] || setting DATA "$data"
fi
[[ -e $dest$defaults ]] || install -m 644 /dev/null "$dest$defaults"
if [[ -z $prefix ]]; then
    in_target chown -R fedspeech:fedspeech "$STATE"
    if ! $listen_only; then
        data_dir=$(sed -n 's/^DATA=//p' "$dest$defaults")
        in_target install -d -o fedspeech -g fedspeech -m 750 "$data_dir"
    fi
fi

# 5. the unit
if ! cmp -s "$HERE/$unit" "$dest/etc/systemd/system/$unit"; then
    say "/etc/systemd/system/$unit"
    install -D -m 644 "$HERE/$unit" "$dest/etc/systemd/system/$unit"
fi
incomplete=()
for key in COORDINATOR BROKER; do
    grep -q "^$key=." "$dest$defaults" || incomplete+=("$key")
done
if [[ -n $prefix ]]; then
    say "--prefix: not enabling $unit"
elif [[ -z $root && -d /run/systemd/system ]]; then
    systemctl daemon-reload
    systemctl enable "$unit"
    if [[ ${#incomplete[@]} -eq 0 ]]; then
        systemctl restart "$unit"
        say "started $unit: journalctl -u ${unit%.service} -f"
    fi
elif command -v systemctl >/dev/null; then
    # a chroot or a container: enable it (links only) for the system's next boot
    systemctl --root="${root:-/}" enable "$unit"
    say "systemd is not running here: $unit is enabled for the next boot, not started"
else
    say "systemd is not running here and there is no systemctl: enable $unit on the device"
fi
if [[ ${#incomplete[@]} -gt 0 ]]; then
    say "set ${incomplete[*]} in $defaults (or run again with the options) before $unit can start"
fi
version=$(in_target "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("fedspeech"))')
say "fedspeech $version ($extras) is installed in $VENV"
