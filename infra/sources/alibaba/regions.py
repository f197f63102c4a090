"""Alibaba Cloud region ids, and the shape of their zone ids: checked before anything is looked up or created.

An unknown region is reported as such ("unknown region"), never as "no stock", which is what the stock-aware data
sources would otherwise answer for it.

Source of the region list: aliyun/terraform-provider-alicloud `alicloud/connectivity/regions.go` (`ValidRegions`,
commit 81c43b67, 2026-08-21; the provider Pulumi's alicloud package is bridged from), the public commercial regions
only (the finance and government regions need special accounts). UNCONFIRMED as today's full public list: Alibaba
adds regions; DescribeRegions is the live answer ("You can call the DescribeRegions operation to query the most
recent region list"). A region missing here is a one-line addition.

Zone ids (Alibaba SDK docstrings, Function Compute's zone table; reference/alibaba-cloud-verified.md §9): mainland
China and Hong Kong zones are `<region>-<letter>` (`cn-hangzhou-i`, `cn-wulanchabu-a`); overseas zones are
`<region><letter>` without a dash (`ap-southeast-1a`, `eu-central-1b`).
"""

from __future__ import annotations

import re

REGIONS: tuple[str, ...] = (
    "cn-hangzhou", "cn-qingdao", "cn-beijing", "cn-shenzhen", "cn-hongkong", "cn-shanghai", "cn-zhangjiakou",
    "cn-huhehaote", "cn-chengdu", "cn-heyuan", "cn-wulanchabu", "cn-guangzhou", "cn-nanjing", "cn-fuzhou",
    "cn-zhongwei",
    "us-west-1", "us-east-1", "us-southeast-1", "na-south-1",
    "ap-northeast-1", "ap-northeast-2", "ap-southeast-1", "ap-southeast-2", "ap-southeast-3", "ap-southeast-5",
    "ap-southeast-6", "ap-southeast-7", "ap-southeast-8", "ap-south-1",
    "me-east-1", "me-central-1", "eu-central-1", "eu-west-1", "rus-west-1",
)


def is_region(region: str) -> bool:
    return region in REGIONS


def zone_pattern(region: str) -> re.Pattern[str]:
    """Zone ids of `region`: `<region>-<letter>` where the region id ends in letters (cn-hangzhou-i),
    `<region><letter>` where it ends in a digit (ap-southeast-1a)."""
    separator = "" if region[-1].isdigit() else "-"
    return re.compile(re.escape(region) + separator + "[a-z]")


def is_zone_of(zone: str, region: str) -> bool:
    return zone_pattern(region).fullmatch(zone) is not None


def example_zone(region: str) -> str:
    return region + ("a" if region[-1].isdigit() else "-k")


def region_of_zone(zone: str) -> str | None:
    """The known region a zone id belongs to, if any (for messages)."""
    for region in REGIONS:
        if is_zone_of(zone, region):
            return region
    return None
