(* The incremental planner: adding and removing constraints keeps a consistent set of
   satisfied constraints with directions, and plans list the constraints to re-execute
   when input variables change. *)

open Constr

exception Cycle
exception Unsatisfiable_required

let current_mark = ref 0
let new_mark () = incr current_mark; !current_mark

let consumers v = List.filter (fun c -> (match v.determined_by with Some d -> d != c | None -> true) && is_satisfied c) v.constraints

let rec incremental_add c =
  let mark = new_mark () in
  let rec loop = function None -> () | Some o -> loop (satisfy o mark) in
  loop (satisfy c mark)

and satisfy c mark =
  choose_method c mark;
  if not (is_satisfied c) then begin
    if c.strength = Strength.Required then raise Unsatisfiable_required;
    None
  end else begin
    mark_inputs c mark;
    let out = output c in
    let overridden = out.determined_by in
    Option.iter mark_unsatisfied overridden;
    out.determined_by <- Some c;
    if not (add_propagate c mark) then raise Cycle;
    out.mark <- mark;
    overridden
  end

and add_propagate c mark =
  let rec go = function
    | [] -> true
    | d :: rest ->
        if (output d).mark = mark then (incremental_remove c; false)
        else begin
          recalculate d;
          go (consumers (output d) @ rest)
        end
  in
  go [ c ]

and incremental_remove c =
  let out = output c in
  mark_unsatisfied c;
  detach c;
  let unsatisfied = remove_propagate_from out in
  let rec by_strength s =
    List.iter (fun u -> if u.strength = s then incremental_add u) unsatisfied;
    if s <> Strength.Weakest then by_strength (Strength.next_weaker s)
  in
  by_strength Strength.Required

and remove_propagate_from out =
  out.determined_by <- None;
  out.walk <- Strength.Weakest;
  out.stay <- true;
  let unsatisfied = ref [] in
  let rec go = function
    | [] -> ()
    | v :: rest ->
        List.iter (fun c -> if not (is_satisfied c) then unsatisfied := c :: !unsatisfied) v.constraints;
        let next = consumers v in
        List.iter recalculate next;
        go (List.map output next @ rest)
  in
  go [ out ];
  List.rev !unsatisfied

let add kind strength =
  let c = { kind; strength; satisfied = false; dir = Undirected } in
  attach c;
  incremental_add c;
  c

let destroy c = if is_satisfied c then incremental_remove c else detach c

(* Constraints to execute, in order, when the given input constraints' variables change. *)
let make_plan sources =
  let mark = new_mark () in
  let rec go plan = function
    | [] -> List.rev plan
    | c :: rest ->
        let o = output c in
        if o.mark <> mark && inputs_known c mark then begin
          o.mark <- mark;
          go (c :: plan) (rest @ consumers o)
        end else go plan rest
  in
  go [] sources

let extract_plan constraints = make_plan (List.filter (fun c -> is_input c && is_satisfied c) constraints)
let run_plan plan = List.iter execute plan
