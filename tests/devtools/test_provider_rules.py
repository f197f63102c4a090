"""The alicloud provider's rules kept as data (devtools/provider_rules/alicloud.json, by tools/provider_rules.py): they
belong to the pulumi-alicloud version the program pins, cover every property the program sets, and the generator
reads the Terraform schema as the provider declares it."""

from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
from offline_helpers import run

from devtools import provider_rules
from devtools.offline_cloud import shipped_stacks, stack_config

REPO = Path(__file__).resolve().parents[2]
MIRROR = Path("/work/.mirror/aliyun+terraform-provider-alicloud/repo")


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("provider_rules_tool", REPO / "tools" / "provider_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rules_are_those_of_the_pinned_provider_and_say_where_they_come_from() -> None:
    data = provider_rules.rules()
    pin = re.search(r"^pulumi-alicloud==(\S+)$", (REPO / "requirements.txt").read_text(), re.M)
    assert pin and data["version"] == pin.group(1)
    assert data["generatedBy"] == "tools/provider_rules.py"
    assert data["upstream"]["module"] == "github.com/aliyun/terraform-provider-alicloud"
    assert re.fullmatch(r"v1\.\d+\.\d+", data["upstream"]["version"]) and len(data["upstream"]["commit"]) == 40
    assert data["sources"] and all(len(h) == 64 for h in data["sources"].values())


@pytest.mark.parametrize("stack", [s for s in shipped_stacks()
                                   if stack_config(s).get("roll-cluster:nodes", {}).get("source") != "hosts"])
def test_every_property_the_program_sets_on_alicloud_is_known_to_the_rules(stack: str) -> None:
    cloud = run(stack).cloud
    unknown = sorted(f"{r.type} {key}" for r in cloud.resources if r.type.startswith("alicloud:")
                     for key in r.inputs if key not in provider_rules.rules()["resources"][r.type]["fields"])
    assert unknown == []
    for token, args in cloud.invokes:
        if token in provider_rules.rules()["dataSources"]:
            fields = provider_rules.rules()["dataSources"][token]["fields"]
            assert sorted(k for k in args if k not in fields) == [], token


@pytest.mark.skipif(not (MIRROR / "HEAD").exists(), reason="no terraform-provider-alicloud mirror on this machine")
def test_the_committed_rules_are_what_the_generator_makes_from_the_recorded_commit() -> None:
    data = provider_rules.rules()
    tool = generator()
    again = tool.generate(MIRROR, data["upstream"]["commit"], data["version"], data["upstream"]["version"],
                          data["upstream"]["note"])
    assert {k: v for k, v in again.items() if k != "upstream"} == {k: v for k, v in data.items() if k != "upstream"}


def test_the_generator_reads_a_terraform_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = generator()
    (tmp_path / "alicloud").mkdir()
    (tmp_path / "alicloud" / "common.go").write_text('const (\n\tPostPaid = InstanceChargeType("PostPaid")\n)\n')
    (tmp_path / "alicloud" / "resource_alicloud_thing.go").write_text(textwrap.dedent('''
        func resourceThing() *schema.Resource {
            return &schema.Resource{
                CustomizeDiff: thingDiff,
                Schema: map[string]*schema.Schema{
                    // a comment with a brace {
                    "zone_id": {
                        Type:     schema.TypeString,
                        Required: true,
                        ForceNew: true,
                    },
                    "name": {
                        Type:          schema.TypeString,
                        Optional:      true,
                        Description:   "a } brace in a string",
                        ConflictsWith: []string{"thing_name"},
                        AtLeastOneOf:  []string{"name", "thing_name"},
                    },
                    "charge": {
                        Type:         schema.TypeString,
                        Optional:     true,
                        Default:      "PostPaid",
                        ValidateFunc: StringInSlice([]string{string(PostPaid), "PrePaid"}, false),
                    },
                    "disks": {
                        Type:     schema.TypeList,
                        Optional: true,
                        ForceNew: true,
                        Elem: &schema.Resource{
                            Schema: map[string]*schema.Schema{
                                "size_gb": {Type: schema.TypeInt, Required: true},
                            },
                        },
                    },
                    "tags": tagsSchema(),
                },
            }
        }

        func thingDiff(d *schema.ResourceDiff) error {
            if d.HasChange("image_id") {
                d.ForceNew("image_id")
            }
            return nil
        }
    '''))
    monkeypatch.setattr(tool, "RESOURCES", {"test:index/thing:Thing": ("t_thing", "resource_alicloud_thing.go")})
    monkeypatch.setattr(tool, "DATA_SOURCES", {})
    data = tool.generate(tmp_path, None, "1.0.0", "v9.9.9", "")
    thing = data["resources"]["test:index/thing:Thing"]
    fields = thing["fields"]
    assert fields["zoneId"]["required"] and fields["zoneId"]["forceNew"]
    assert fields["name"]["conflictsWith"] == ["thingName"]
    assert fields["name"]["atLeastOneOf"] == ["name", "thingName"]
    assert fields["charge"]["allowed"] == ["PostPaid", "PrePaid"] and fields["charge"]["default"] == "PostPaid"
    # A child of a ForceNew block forces a new resource too.
    assert fields["disks[*].sizeGb"]["required"] and fields["disks[*].sizeGb"]["forceNew"]
    assert fields["tags"]["helper"] == "tagsSchema()"
    assert thing["forceNewIf"] == [{"field": "imageId", "tf": "image_id", "line": 42, "in": "thingDiff"}]
    json.dumps(data)  # the data is plain JSON
