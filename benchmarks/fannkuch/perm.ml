(* Small in-place operations on int-array permutations. *)

let swap (a : int array) i j =
  let t = Array.unsafe_get a i in
  Array.unsafe_set a i (Array.unsafe_get a j);
  Array.unsafe_set a j t

(* reverse a.(0) .. a.(k) *)
let reverse_prefix a k =
  let i = ref 0 and j = ref k in
  while !i < !j do
    swap a !i !j;
    incr i;
    decr j
  done

(* move a.(0) to position k, shifting a.(1) .. a.(k) down by one *)
let rotate_prefix a k =
  let first = a.(0) in
  for i = 0 to k - 1 do
    Array.unsafe_set a i (Array.unsafe_get a (i + 1))
  done;
  a.(k) <- first

(* pancake flips of the first (a.(0)+1) elements until 0 comes first; [scratch] is
   overwritten *)
let count_flips ~scratch p =
  let n = Array.length p in
  Array.blit p 0 scratch 0 n;
  let flips = ref 0 in
  let rec go () =
    let top = Array.unsafe_get scratch 0 in
    if top <> 0 then begin
      reverse_prefix scratch top;
      incr flips;
      go ()
    end
  in
  go ();
  !flips
