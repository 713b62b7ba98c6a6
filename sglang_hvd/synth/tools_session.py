"""synth-tools: a support agent working through a customer's orders with tool calls.

Every session follows the same loop (look up the customer, look up each order, act on
it, confirm), so call structure repeats within and across sessions, while the arguments
(order ids, dates, amounts) come from the changing state: the situation in which a cache
draft pays off for the boilerplate and breaks at the argument.
"""

from __future__ import annotations

import random
from typing import Any

from .common import amount, assistant, date, ident, person, tool_call, tool_result, tool_schema

SOURCE = "synth-tools"

SYSTEM = (
    "You are the support agent of Parcelry, an online store. Help the customer with their orders.\n"
    "Policy:\n"
    "- Always look up the customer with get_customer before acting on any order.\n"
    "- Look up every order with get_order before changing it.\n"
    "- Refunds are allowed for delivered orders within 30 days; refund the exact item total.\n"
    "- Deliveries can be rescheduled to any date in the next 14 days, in a morning or evening window.\n"
    "- Confirm each action to the customer with the order id and the new state.\n"
    "- Be brief and precise."
)

TOOLS = [
    tool_schema("get_customer", "Look up a customer by email.", {"email": "string"}),
    tool_schema("get_order", "Get the details of an order.", {"order_id": "string"}),
    tool_schema(
        "refund_order",
        "Refund an order to its original payment method.",
        {"order_id": "string", "amount": "number", "reason": "string"},
    ),
    tool_schema(
        "reschedule_delivery",
        "Move the delivery of an order to a new date and window.",
        {"order_id": "string", "date": "string", "window": "string"},
    ),
    tool_schema(
        "update_address",
        "Change the shipping address of an undelivered order.",
        {"order_id": "string", "street": "string", "city": "string", "zip": "string"},
    ),
]

PRODUCTS = ["wireless earbuds", "standing desk", "espresso grinder", "yoga mat", "usb-c hub", "rain jacket",
            "desk lamp", "water bottle", "mechanical keyboard", "hiking boots", "air purifier", "backpack"]
REASONS = ["arrived damaged", "wrong size", "not as described", "arrived late", "changed my mind"]
STREETS = ["Maple Ave", "King St", "Harbor Rd", "Elm St", "Pine Ct", "Lake Dr"]


def _order(rng: random.Random) -> dict[str, Any]:
    status = rng.choice(["delivered", "delivered", "in_transit", "processing"])
    items = [{"name": rng.choice(PRODUCTS), "qty": rng.randint(1, 3), "price": amount(rng, 9, 300)}
             for _ in range(rng.randint(1, 3))]
    return {
        "order_id": ident(rng, "ORD-"),
        "status": status,
        "placed": date(rng),
        "items": items,
        "total": round(sum(i["qty"] * i["price"] for i in items), 2),
        "payment": rng.choice(["visa-4242", "mastercard-5100", "gift_card", "paypal"]),
    }


def session(rng: random.Random, index: int) -> dict[str, Any]:
    first, last = person(rng)
    email = f"{first.lower()}.{last.lower()}{rng.randint(1, 99)}@example.com"
    customer_id = ident(rng, "CUS-")
    orders = [_order(rng) for _ in range(rng.randint(2, 6))]
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    hello = f"Hi, this is {first} {last} ({email}). I need help with my recent orders."
    messages.append({"role": "user", "content": hello})

    call = tool_call(rng, "get_customer", {"email": email})
    messages += [assistant(None, [call]), tool_result(call, {
        "customer_id": customer_id, "name": f"{first} {last}", "email": email,
        "orders": [o["order_id"] for o in orders], "member_since": date(rng, 2021),
    })]
    messages.append(assistant(
        f"Thanks, {first}. I can see {len(orders)} orders on your account: "
        + ", ".join(o["order_id"] for o in orders)
        + ". Which one would you like help with?"
    ))
    for order in orders:
        want = rng.choice(["refund", "reschedule", "address", "status"])
        if want == "refund":
            ask = f"For {order['order_id']}, the {order['items'][0]['name']} {rng.choice(REASONS)}. Can I get a refund?"
        elif want == "reschedule":
            ask = f"Can you move the delivery of {order['order_id']} to {date(rng)}?"
        elif want == "address":
            ask = f"Please ship {order['order_id']} to my new address instead."
        else:
            ask = f"What is the status of {order['order_id']}?"
        messages.append({"role": "user", "content": ask})
        call = tool_call(rng, "get_order", {"order_id": order["order_id"]})
        messages += [assistant(None, [call]), tool_result(call, order)]

        if want == "refund" and order["status"] == "delivered":
            call = tool_call(rng, "refund_order",
                             {"order_id": order["order_id"], "amount": order["total"], "reason": rng.choice(REASONS)})
            refunded = {"order_id": order["order_id"], "refunded": order["total"], "to": order["payment"],
                        "status": "refunded"}
            messages += [assistant(None, [call]), tool_result(call, refunded)]
            reply = (f"Done: order {order['order_id']} has been refunded ${order['total']:.2f} "
                     f"to your {order['payment']}. You should see it within 3-5 business days.")
        elif want == "reschedule" and order["status"] != "delivered":
            new_date, window = date(rng), rng.choice(["morning", "evening"])
            call = tool_call(rng, "reschedule_delivery",
                             {"order_id": order["order_id"], "date": new_date, "window": window})
            rescheduled = {"order_id": order["order_id"], "delivery_date": new_date, "window": window}
            messages += [assistant(None, [call]), tool_result(call, rescheduled)]
            reply = (f"Done: the delivery of order {order['order_id']} is now scheduled for {new_date} "
                     f"({window} window).")
        elif want == "address" and order["status"] == "processing":
            messages.append(assistant("Sure. What is the new street, city and zip code?"))
            street = f"{rng.randint(1, 999)} {rng.choice(STREETS)}"
            city = rng.choice(["Austin", "Denver", "Boston"])
            zipc = f"{rng.randint(10000, 99999)}"
            messages.append({"role": "user", "content": f"{street}, {city} {zipc}"})
            call = tool_call(rng, "update_address",
                             {"order_id": order["order_id"], "street": street, "city": city, "zip": zipc})
            updated = {"order_id": order["order_id"], "ship_to": f"{street}, {city} {zipc}"}
            messages += [assistant(None, [call]), tool_result(call, updated)]
            reply = f"Done: order {order['order_id']} will now ship to {street}, {city} {zipc}."
        else:
            item_list = ", ".join(f"{i['qty']}x {i['name']}" for i in order["items"])
            status = order["status"].replace("_", " ")
            reply = (f"Order {order['order_id']} ({item_list}, total ${order['total']:.2f}) is currently {status}."
                     + ("" if want == "status" else f" Unfortunately I can't do that for an order that is {status}."))
        messages.append(assistant(reply + " Is there anything else I can help you with?"))
    messages.append({"role": "user", "content": "No, that's all. Thanks!"})
    messages.append(assistant(f"You're welcome, {first}! Have a great day."))
    return {"id": f"{SOURCE}/{index:04d}", "source": SOURCE, "model": "synthetic", "license": "Apache-2.0",
            "tools": TOOLS, "messages": messages}
