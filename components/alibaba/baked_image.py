"""Baking: an ECS custom image of a bootstrapped node (nodes.bake), so that later clusters boot with the driver,
Docker, the NVIDIA toolkit and the training image already on their disks (nodes.image).

CreateImage from an instance snapshots every disk of the instance, data disks included, and the image can be used
once it is Available (alibabacloud.com/help/en/ecs/api-createimage;
verified-facts#baked-image-alibaba-cloud-verified). How long that takes depends on the disks' size: the reference
has no figure (UNCONFIRMED), so the create timeout is raised from the provider's 10 minutes to 60.

The image outlives the stack: `retain_on_delete` makes `pulumi destroy` drop it from the state without deleting it,
because other stacks boot from it. It is deleted by hand (docs/performance.md, 'Baked images'):
`aliyun ecs DeleteImage --RegionId <region> --ImageId <id>` or the console, then its snapshots.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_alicloud as alicloud

CREATE_TIMEOUT = "60m"


def bake_image(
    name: str, stack: str, instance_id: pulumi.Input[str], after: Sequence[pulumi.Resource], parent: pulumi.Resource
) -> tuple[pulumi.Resource, pulumi.Output[str]]:
    """The custom image of one instance, made once `after` is done; returns it and its id (`m-...`)."""
    image = alicloud.ecs.Image(
        name,
        instance_id=instance_id,
        # Image names are unique per account and region (UNCONFIRMED): the instance id makes each bake's distinct.
        image_name=pulumi.Output.concat("roll-cluster-", stack, "-", instance_id),
        description=f"roll-cluster stack {stack}: GPU driver, Docker, NVIDIA toolkit and the training image",
        tags={"roll-cluster-stack": stack, "roll-cluster-role": "baked-image"},
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=list(after),
            retain_on_delete=True,
            custom_timeouts=pulumi.CustomTimeouts(create=CREATE_TIMEOUT),
            # A re-bake is a new image (and a new id for other stacks), made only when the head is a new instance:
            # the provider would rename the old image instead (TF resource_alicloud_image.go instance_id is not
            # ForceNew; its update only calls ModifyImageAttribute). retain_on_delete keeps the old image.
            # see verified-facts#baked-image-image
            ignore_changes=["description", "tags"],
            replace_on_changes=["instanceId"],
        ),
    )
    return image, image.id
