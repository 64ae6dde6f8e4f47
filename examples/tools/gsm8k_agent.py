"""A tool and an interaction for examples/multi-turn-tools.yaml, shipped in the job's ConfigMap
beside tools.yaml and interaction.yaml (mounted together at /etc/rlkube-agent, so
`class_name: gsm8k_agent.CalculatorTool` imports this file).

CalculatorTool evaluates arithmetic without running code; Gsm8kInteraction plays the user: it
checks the model's final answer against the row's `extra_info.interaction_kwargs.ground_truth`,
asks once more when it is wrong, and gives each turn a score the reward function can read
(extra_info.rollout_reward_scores.turn_scores)."""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

from rlkube_trainer.tools import BaseInteraction, BaseTool, InteractionReply, ToolResponse, ToolResult

_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def evaluate(expression: str) -> float:
    """+, -, *, / and parentheses over numbers; anything else is refused."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return float(_OPS[type(node.op)](walk(node.left), walk(node.right)))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return float(_OPS[type(node.op)](walk(node.operand)))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:40]}")

    return walk(ast.parse(expression, mode="eval").body)


class CalculatorTool(BaseTool):
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> ToolResult:
        try:
            value = evaluate(str(parameters.get("expression", "")))
        except (ValueError, SyntaxError, ZeroDivisionError) as exc:
            return ToolResponse(text=f"Error: {exc}"), 0.0, {}
        text = str(int(value)) if value.is_integer() else f"{value:.{self.config.get('digits', 6)}g}"
        return ToolResponse(text=text), 0.0, {}


class Gsm8kInteraction(BaseInteraction):
    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> InteractionReply:
        numbers = re.findall(r"-?\d+(?:\.\d+)?", str(messages[-1].get("content", "")).replace(",", ""))
        right = bool(numbers) and numbers[-1] == str(kwargs.get("ground_truth"))
        if right:
            return True, "Correct.", 1.0, {}
        return False, self.config.get("retry_prompt", "That is not right. Check your work."), 0.0, {}
