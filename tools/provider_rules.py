#!/usr/bin/env python3
"""Generate the alicloud provider's rules for the resources and data sources the program uses, from the Terraform
provider's own Go source (pulumi-alicloud bridges aliyun/terraform-provider-alicloud; the bridge takes ForceNew,
Required, ConflictsWith, AtLeastOneOf, ExactlyOneOf, defaults and validators from the TF schema at run time, and the
installed SDK carries none of them in structured form: its docstrings only).

    python3 tools/provider_rules.py --source <terraform-provider-alicloud checkout> --ref v1.289.0 \
        > devtools/provider_rules/alicloud.json

Reads each file with `git show <ref>:<path>` (no work tree needed; without --ref the files are read from the
directory) and parses the `map[string]*schema.Schema{...}` literal of each resource/data source in Python (no Go
toolchain): brace matching that skips strings and comments, one entry per key, nested `Elem: &schema.Resource`
blocks as `parent[*].child`. CustomizeDiff functions are scanned for `d.ForceNew("x")` (recorded as conditional).
An entry whose value is a helper call (`tagsSchema()`) is recorded as such. The offline cloud enforces the result
(devtools/provider_rules.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

# Pulumi token -> TF name and file (tokens: pulumi-alicloud provider/resources.go, `Tok: tfbridge.MakeResource(...)`;
# the SDK modules under pulumi_alicloud/ name the same tokens in their `__init__`/`_utilities` registration).
RESOURCES: dict[str, tuple[str, str]] = {
    "alicloud:vpc/network:Network": ("alicloud_vpc", "resource_alicloud_vpc.go"),
    "alicloud:vpc/switch:Switch": ("alicloud_vswitch", "resource_alicloud_vswitch.go"),
    "alicloud:ecs/securityGroup:SecurityGroup": ("alicloud_security_group", "resource_alicloud_security_group.go"),
    "alicloud:ecs/securityGroupRule:SecurityGroupRule": (
        "alicloud_security_group_rule", "resource_alicloud_security_group_rule.go"),
    "alicloud:ecs/instance:Instance": ("alicloud_instance", "resource_alicloud_instance.go"),
    "alicloud:ecs/ecsKeyPair:EcsKeyPair": ("alicloud_ecs_key_pair", "resource_alicloud_ecs_key_pair.go"),
    "alicloud:ecs/image:Image": ("alicloud_image", "resource_alicloud_image.go"),
    "alicloud:nas/fileSystem:FileSystem": ("alicloud_nas_file_system", "resource_alicloud_nas_file_system.go"),
    "alicloud:nas/mountTarget:MountTarget": ("alicloud_nas_mount_target", "resource_alicloud_nas_mount_target.go"),
    "alicloud:nas/accessGroup:AccessGroup": ("alicloud_nas_access_group", "resource_alicloud_nas_access_group.go"),
    "alicloud:nas/accessRule:AccessRule": ("alicloud_nas_access_rule", "resource_alicloud_nas_access_rule.go"),
    # nodes.autostop: the head's instance RAM role (components/autostop.py).
    "alicloud:ram/role:Role": ("alicloud_ram_role", "resource_alicloud_ram_role.go"),
    "alicloud:ram/policy:Policy": ("alicloud_ram_policy", "resource_alicloud_ram_policy.go"),
    "alicloud:ram/rolePolicyAttachment:RolePolicyAttachment": (
        "alicloud_ram_role_policy_attachment", "resource_alicloud_ram_role_policy_attachment.go"),
    "alicloud:ecs/ramRoleAttachment:RamRoleAttachment": (
        "alicloud_ecs_ram_role_attachment", "resource_alicloud_ecs_ram_role_attachment.go"),
}
DATA_SOURCES: dict[str, tuple[str, str]] = {
    "alicloud:index/getZones:getZones": ("alicloud_zones", "data_source_alicloud_zones.go"),
    "alicloud:ecs/getInstanceTypes:getInstanceTypes": (
        "alicloud_instance_types", "data_source_alicloud_instance_types.go"),
    "alicloud:ecs/getImages:getImages": ("alicloud_images", "data_source_alicloud_images.go"),
    "alicloud:vpc/getSwitches:getSwitches": ("alicloud_vswitches", "data_source_alicloud_vswitches.go"),
    "alicloud:ecs/getInstances:getInstances": ("alicloud_instances", "data_source_alicloud_instances.go"),
    "alicloud:ecs/getEcsDisks:getEcsDisks": ("alicloud_ecs_disks", "data_source_alicloud_ecs_disks.go"),
    "alicloud:nas/getZones:getZones": ("alicloud_nas_zones", "data_source_alicloud_nas_zones.go"),
    "alicloud:cloudcontrol/getPrices:getPrices": (
        "alicloud_cloud_control_prices", "data_source_alicloud_cloud_control_prices.go"),
}

_SCHEMA_MAP = re.compile(r"Schema\s*:\s*map\[string\]\*schema\.Schema\s*\{")
_ELEM_RESOURCE = re.compile(r"Elem\s*:\s*&schema\.Resource\s*\{")


class ParseError(RuntimeError):
    pass


def match_brace(text: str, start: int) -> int:
    """Index of the `}` closing the `{` at `start`, skipping Go strings, raw strings, runes and comments."""
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "'":
            i += 1
            while text[i] != "'":
                i += 2 if text[i] == "\\" else 1
        elif c == "`":
            i = text.index("`", i + 1)
        elif text.startswith("//", i):
            i = text.index("\n", i)
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ParseError(f"unbalanced brace at offset {start}")


def camel(tf_name: str) -> str:
    """The bridge's default TF -> Pulumi property name: snake_case -> camelCase (no override for these fields:
    pulumi-alicloud's resources.go sets no `Fields` on them, UNCONFIRMED at v4.0.0, see --help)."""
    head, *rest = tf_name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def pulumi_path(tf_path: str) -> str:
    """`data_disks.*.size` or `data_disks.0.size` -> `dataDisks[*].size`."""
    out: list[str] = []
    for part in tf_path.split("."):
        if part in ("*", "0") or part.isdigit():
            out[-1] += "[*]"
        else:
            out.append(camel(part))
    return ".".join(out)


def _strip_elem(body: str) -> str:
    found = _ELEM_RESOURCE.search(body)
    if not found:
        return body
    start = found.end() - 1
    return body[:start] + body[match_brace(body, start) + 1:]


# Go string constants of the provider package (`ResourceTypeVSwitch = ResourceType("VSwitch")`, `PostPaid =
# InstanceChargeType("PostPaid")`, `Vpc = "vpc"`), used inside StringInSlice lists; filled by generate().
CONSTANTS: dict[str, str] = {}
_CONSTANT = re.compile(r'^\s*(\w+)\s*(?:\w+\s*)?=\s*(?:\w+\()?"([^"]*)"\)?\s*(?://.*)?$', re.M)


def _slice_values(items: str) -> list[str] | None:
    """The values of a `[]string{...}` literal; None when an element is neither a literal nor a known constant."""
    values: list[str] = []
    for item in (x.strip() for x in re.sub(r"//[^\n]*", "", items).split(",")):
        if not item:
            continue
        literal = re.fullmatch(r'"([^"]*)"', item)
        constant = re.fullmatch(r"(?:string\()?(\w+)\)?", item)
        if literal:
            values.append(literal.group(1))
        elif constant and constant.group(1) in CONSTANTS:
            values.append(CONSTANTS[constant.group(1)])
        else:
            return None
    return values


def _validate(top: str) -> dict[str, Any]:
    """Allowed values and ranges from the validators the bridge runs (StringInSlice / IntBetween / IntInSlice)."""
    found: dict[str, Any] = {}
    m = re.search(r"ValidateFunc\s*:\s*(?:validation\.)?StringInSlice\(\s*\[\]string\{([^}]*)\}\s*,\s*(true|false)",
                  top)
    values = _slice_values(m.group(1)) if m else None
    if m and values is not None:
        found["allowed"] = values
        if m.group(2) == "true":
            found["ignoreCase"] = True
    m = re.search(r"ValidateFunc\s*:\s*(?:validation\.)?IntBetween\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)", top)
    if m:
        found["range"] = [int(m.group(1)), int(m.group(2))]
    m = re.search(r"ValidateFunc\s*:\s*(?:validation\.)?IntInSlice\(\s*\[\]int\{([^}]*)\}", top)
    if m:
        found["allowed"] = [int(x) for x in re.findall(r"-?\d+", m.group(1))]
    return found


def parse_schema_map(text: str, start: int, prefix: str = "", parent_force_new: bool = False) -> dict[str, Any]:
    """Fields of the schema map literal whose `{` is at `start`, keyed by TF path (`data_disks.*.size`)."""
    end = match_brace(text, start)
    i = start + 1
    out: dict[str, Any] = {}
    skip = re.compile(r"\s*(//[^\n]*\n|/\*.*?\*/)?", re.S)
    helper = re.compile(r'\s*"([a-z0-9_]+)"\s*:\s*([A-Za-z_][\w.]*\([^)]*\))\s*,')
    entry = re.compile(r'\s*"([a-z0-9_]+)"\s*:\s*(?:&schema\.Schema)?\{')
    while True:
        while True:
            ws = skip.match(text, i)
            if ws is None or ws.end() == i:
                break
            i = ws.end()
        h = helper.match(text, i)
        if h and h.end() <= end:
            out[prefix + h.group(1)] = {"line": text.count("\n", 0, h.start(1)) + 1, "helper": h.group(2),
                                        **({"forceNew": True} if parent_force_new else {})}
            i = h.end()
            continue
        m = entry.match(text, i)
        if not m or m.end() > end:
            break
        body_start = m.end() - 1
        body_end = match_brace(text, body_start)
        body = text[body_start + 1:body_end]
        top = _strip_elem(body)
        field: dict[str, Any] = {"line": text.count("\n", 0, m.start(1)) + 1}
        t = re.search(r"\bType\s*:\s*schema\.Type(\w+)", top)
        field["type"] = t.group(1).lower() if t else None
        for key in ("Required", "Optional", "Computed", "ForceNew", "Sensitive"):
            if re.search(rf"\b{key}\s*:\s*true", top):
                field[key[0].lower() + key[1:]] = True
        if parent_force_new:
            field["forceNew"] = True
        for key in ("ConflictsWith", "AtLeastOneOf", "ExactlyOneOf", "RequiredWith"):
            lst = re.search(rf"\b{key}\s*:\s*\[\]string\{{([^}}]*)\}}", top)
            if lst:
                field[key[0].lower() + key[1:]] = re.findall(r'"([^"]+)"', lst.group(1))
        d = re.search(r"\bDefault\s*:\s*([^,\n]+)", top)
        if d:
            raw = d.group(1).strip()
            field["default"] = json.loads(raw) if re.fullmatch(r'"[^"]*"|-?\d+|true|false', raw) else raw
        field.update(_validate(top))
        if re.search(r"\bDeprecated\s*:", top):
            field["deprecated"] = True
        if re.search(r"\bRemoved\s*:", top):
            field["removed"] = True
        ds = re.search(r"\bDiffSuppressFunc\s*:\s*([\w.]+)", top)
        if ds:
            field["diffSuppress"] = ds.group(1)
        name = prefix + m.group(1)
        out[name] = field
        elem = _ELEM_RESOURCE.search(body)
        if elem:
            inner = _SCHEMA_MAP.search(body, elem.end())
            if inner:
                out.update(parse_schema_map(text, body_start + 1 + inner.end() - 1, name + ".*.",
                                            parent_force_new or bool(field.get("forceNew"))))
        i = body_end + 1
        comma = re.compile(r"\s*,").match(text, i)
        if comma:
            i = comma.end()
    return out


def conditional_force_new(text: str) -> list[dict[str, Any]]:
    """`d.ForceNew("x")` calls in the file (CustomizeDiff functions): the field forces a new resource only when the
    function's condition holds (e.g. instance image_id with the provider feature ecs_instance.replace_on_image_update,
    off by default)."""
    found = []
    for m in re.finditer(r'\bd(?:iff)?\.ForceNew\("([a-z0-9_.]+)"\)', text):
        func = None
        for f in re.finditer(r"\nfunc (\w+)\(", text[: m.start()]):
            func = f.group(1)
        found.append({"field": pulumi_path(m.group(1)), "tf": m.group(1), "line": text.count("\n", 0, m.start()) + 1,
                      "in": func})
    return found


def rules_of(text: str, path: str) -> dict[str, Any]:
    m = _SCHEMA_MAP.search(text)
    if m is None:
        raise ParseError(f"{path}: no schema map")
    fields = parse_schema_map(text, m.end() - 1)
    converted: dict[str, Any] = {}
    for tf_path, field in fields.items():
        if field.get("removed"):
            continue
        item = {"tf": tf_path, **field}
        for key in ("conflictsWith", "atLeastOneOf", "exactlyOneOf", "requiredWith"):
            if key in item:
                item[key] = [pulumi_path(x) for x in item[key]]
        converted[pulumi_path(tf_path)] = item
    rules: dict[str, Any] = {"file": f"alicloud/{path}", "fields": converted}
    conditional = conditional_force_new(text)
    if conditional:
        rules["forceNewIf"] = conditional
    return rules


def read(source: Path, ref: str | None, path: str) -> str:
    if ref is None:
        return (source / path).read_text()
    return subprocess.run(["git", "-C", str(source), "show", f"{ref}:{path}"], capture_output=True, text=True,
                          check=True).stdout


def generate(source: Path, ref: str | None, package_version: str, upstream_version: str,
             note: str) -> dict[str, Any]:
    commit = None
    if ref is not None:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", f"{ref}^{{commit}}"], capture_output=True,
                                text=True, check=True).stdout.strip()
    data: dict[str, Any] = {
        "package": "pulumi-alicloud",
        "version": package_version,
        "generatedBy": "tools/provider_rules.py",
        "upstream": {"module": "github.com/aliyun/terraform-provider-alicloud", "version": upstream_version,
                     "commit": commit, "note": note},
        "sources": {},
        "resources": {},
        "dataSources": {},
    }
    for constants_file in ("common.go", "service_alicloud_ecs.go", "common_nas.go"):
        try:
            CONSTANTS.update(dict(_CONSTANT.findall(read(source, ref, f"alicloud/{constants_file}"))))
        except (OSError, subprocess.CalledProcessError):
            continue
    for section, table in (("resources", RESOURCES), ("dataSources", DATA_SOURCES)):
        for token, (tf_name, file_name) in sorted(table.items()):
            path = f"alicloud/{file_name}"
            text = read(source, ref, path)
            data["sources"][path] = hashlib.sha256(text.encode()).hexdigest()
            data[section][token] = {"tf": tf_name, **rules_of(text, file_name)}
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True, help="terraform-provider-alicloud checkout or git dir")
    parser.add_argument("--ref", help="git tag or commit to read (default: the files in --source)")
    parser.add_argument("--package-version", default="4.0.0", help="the pulumi-alicloud version (requirements.txt)")
    parser.add_argument("--upstream-version", help="the TF provider version read (default: --ref)")
    parser.add_argument("--note", default="", help="why this upstream version (recorded in the data)")
    args = parser.parse_args(argv)
    data = generate(args.source, args.ref, args.package_version, args.upstream_version or args.ref or "local",
                    args.note)
    json.dump(data, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
