#!/usr/bin/env python3
"""Prints the CPU that services most of the interrupts of the disk holding PATH, or nothing
when that cannot be told (not a block device with its own interrupt lines in /proc/interrupts).

Why a bench needs it: a thread waiting in fdatasync is woken by the disk's completion
interrupt; on another CPU than the one that interrupt lands on, the wake-up is a cross-CPU
interrupt, which in a VM costs most of a sync (the figures: docs/deploy.md, "One node: the
embedded store"). A latency-tuned deployment keeps the store on the interrupts' CPUs, so the
benches place idemd there.

    disk-irq-cpu.py PATH
"""
import os
import re
import subprocess
import sys


def disk_of(path: str) -> str:
    """The whole-disk block device name (vda, nvme0n1) under PATH's file system."""
    source = subprocess.run(["df", "--output=source", path], capture_output=True, text=True,
                            check=True).stdout.split()[-1]
    name = os.path.basename(os.path.realpath(source))
    # A partition's sysfs directory sits inside its disk's.
    parent = os.path.basename(os.path.dirname(os.path.realpath(f"/sys/class/block/{name}")))
    return parent if os.path.exists(f"/sys/block/{parent}") else name


def main() -> None:
    disk = disk_of(sys.argv[1])
    if not os.path.exists(f"/sys/block/{disk}/device"):
        return
    # The device behind the disk: virtio1 (lines "virtio1-req.0"), nvme0 ("nvme0q1"), ...
    device = os.path.basename(os.path.realpath(f"/sys/block/{disk}/device"))
    pattern = re.compile(rf"\b{re.escape(device)}(?:-|q\d)")
    with open("/proc/interrupts") as f:
        cpus = f.readline().split()
        totals = [0] * len(cpus)
        for line in f:
            fields = line.split()
            if not pattern.search(line) or len(fields) <= len(cpus):
                continue
            for i, count in enumerate(fields[1:1 + len(cpus)]):
                if count.isdigit():
                    totals[i] += int(count)
    if sum(totals) > 0:
        print(cpus[totals.index(max(totals))].removeprefix("CPU"))


if __name__ == "__main__":
    main()
